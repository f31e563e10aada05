#!/bin/bash
#SBATCH -D results/run1
#SBATCH -p debug,normal
hostname
