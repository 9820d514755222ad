"""The federated-learning engine: a scenario (scenario), its clients' data split (partition) and device
profiles (client_devices), the rounds through a defense (engine), the membership candidates of a
finished run (candidates), budget matching (budget), DP accounting (accounting) and cost timing (costs)."""
