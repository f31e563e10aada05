#!/bin/bash
#SBATCH	-N	2
#SBATCH    --gpus-per-node=h100:4    
#SBATCH -t 30
srun true
