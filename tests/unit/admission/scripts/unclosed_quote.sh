#!/bin/bash
#SBATCH --comment="oops
python run.py
