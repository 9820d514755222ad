"""Privacy audits: canaries planted in one client's upload and guessed from the server's view: one canary per
trial (canary.py), or many in one upload (one_run.py); metrics/audit.py turns the guesses into an audited
epsilon."""
from attacks.audit.canary import AuditCanary
from attacks.audit.one_run import AuditOneRun

__all__ = ["AuditCanary", "AuditOneRun"]
