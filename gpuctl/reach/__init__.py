"""The one way gpuctl reaches a node: SSH (options resolved as ``ssh -G`` does, host keys
checked, one pooled connection per node, commands launched the same way whatever the login
shell) and the Slurm client. ``fleet``, ``jobs``, ``accept`` and ``doctor`` call this package;
nothing else opens an SSH connection or runs a Slurm command."""
