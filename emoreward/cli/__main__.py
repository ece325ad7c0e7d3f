"""`python -m emoreward.cli` = the `emoreward` command."""

import sys

from emoreward.cli.main import main


sys.exit(main())
