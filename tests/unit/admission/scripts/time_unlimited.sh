#!/bin/bash
#SBATCH -p large
#SBATCH --time=UNLIMITED
hostname
