#!/bin/bash
#SBATCH --array=1,3,5-7
python eval.py
