#!/bin/bash
#SBATCH --nod=2   # --nodes? --nodelist? --nodefile?
srun hostname
