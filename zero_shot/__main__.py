"""`python -m zero_shot` is gone: zero-shot judges run through the one entry point, `emoreward judge`."""

import sys


sys.stderr.write(
    "python -m zero_shot: the zero-shot judge command is `emoreward judge` (same options), e.g. "
    "`emoreward judge --judge smollm2-135m-text --data emoprefer --output DIR`; `emoreward judge --list` lists "
    "the registered judges\n"
)
sys.exit(2)
