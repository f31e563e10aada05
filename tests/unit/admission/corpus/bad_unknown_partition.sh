#!/bin/bash
#SBATCH -p nosuch
srun true
