#!/bin/bash
#SBATCH --part=debug
#SBATCH --gpus-per-n=2
hostname
