#!/bin/bash
#SBATCH -d afterok:100:101,afterany:102
python post.py
