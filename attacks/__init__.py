"""Built-in attacks; importing the package registers each one."""
from attacks import baselines, dager, dlg, idlg, ilrg, inverting_gradients, mia, negotiation  # noqa: F401
