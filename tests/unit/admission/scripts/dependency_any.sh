#!/bin/bash
#SBATCH --dependency=afternotok:5?afterok:6
python cleanup.py
