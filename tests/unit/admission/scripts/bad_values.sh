#!/bin/bash
#SBATCH -N two
#SBATCH --time=1:xx
#SBATCH --mem=12Q
python run.py
