"""Example plug-ins for the host (see README.md, "Logits processors")."""
