#!/bin/bash
#SBATCH -N 2
#SBATCH -n 16
#SBATCH -c 2
#SBATCH --mem-per-cpu=4G
srun ./mpi_app
