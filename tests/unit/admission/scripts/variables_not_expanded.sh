#!/bin/bash
#SBATCH -o $HOME/logs/%j.out
#SBATCH -D $SCRATCH
python run.py
