"""Slurm as faultlens' job controller: the commands (scontrol, squeue, sbatch) behind one small
class, the decision hook that carries out every action on a Slurm job and its nodes, the launcher
that runs an instrumented job under sbatch, and the node check that returns drained nodes."""
