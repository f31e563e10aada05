#!/bin/bash
#SBATCH -p debug,gpu
#SBATCH -G 1
python quick.py
