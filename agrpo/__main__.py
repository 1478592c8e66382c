"""`python -m agrpo ...` is the same as the `agrpo` console script."""

from agrpo.cli import main

if __name__ == "__main__":
    main()
