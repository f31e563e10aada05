#!/bin/bash
#SBATCH -p gpu,gpuu
srun true
