"""Label recovery: iLRG (exact, from the head's gradient), LLG+ (the head's signs and impact, also on a trained
model), the iDLG-extended and random-guess reference rows, and label leakage from the per-entry maps a client sends
while negotiating what to encrypt."""
