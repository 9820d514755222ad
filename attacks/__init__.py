"""Built-in attacks; importing the package registers each one."""
from attacks import baselines, dager, idlg, ilrg, mia  # noqa: F401
