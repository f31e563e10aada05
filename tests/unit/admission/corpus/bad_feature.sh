#!/bin/bash
#SBATCH --constraint=rack3
srun true
