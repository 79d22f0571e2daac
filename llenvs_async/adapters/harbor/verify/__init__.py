"""Verifying an episode: the collect hooks, the verifier (in the agent's container or its own), its
reward, the artifacts, and why a verifier that needed the internet failed."""
