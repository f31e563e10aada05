#!/bin/bash
#SBATCH --constraint=(ib|nvlink)&rack1
srun true
