"""Entry point of `python -m agrpo.proxy`."""

import sys

from agrpo.proxy.cli import main

if __name__ == "__main__":
    sys.exit(main())
