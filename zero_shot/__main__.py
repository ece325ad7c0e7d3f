"""`python -m zero_shot` = `emoreward judge`."""

import sys

from zero_shot.cli import main


sys.exit(main())
