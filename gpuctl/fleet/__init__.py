"""Links to nodes (local, simulated, SSH, srun), the Fleet that keeps them live, and control."""
