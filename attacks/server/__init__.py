"""Attacks of a malicious server (threat model "malicious-model"): it modifies the model it sends the attacked
client (bench/protocol/attack.py's modify_model) so that the client's update gives its inputs away."""
