"""Launchers for p4d.24xlarge: multi-node torchrun, Slurm, SageMaker."""
