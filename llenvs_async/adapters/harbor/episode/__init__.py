"""An episode of a Harbor task: the environment, its running instance (container, shell, sidecars),
its command-time budget, multi-step tasks and the shared engine."""
