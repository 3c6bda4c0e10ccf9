"""The Slurm bridge (`sia-slurm`, docs/slurm.md): Slurm launches the jobs, Sia's
policy chooses their GPU type, count and batch size.

`translate`: Slurm's JSON -> the policy's request, its reply -> actions (pure);
`commands`: the calls to Slurm's commands; `bridge`: the rounds and `sia-slurm`;
`submit`: the batch script and ticket of `sia slurm submit`.
"""
