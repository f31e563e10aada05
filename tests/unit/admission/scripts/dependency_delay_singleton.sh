#!/bin/bash
#SBATCH --dependency=after:7+10,singleton
python next.py
