#!/bin/bash
#SBATCH --partition=gpu,prod
srun true
