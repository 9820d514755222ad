"""Privacy audits: canaries planted in one client's upload and guessed from the server's view (canary.py);
metrics/audit.py turns the trials into an audited epsilon."""
from attacks.audit.canary import AuditCanary

__all__ = ["AuditCanary"]
