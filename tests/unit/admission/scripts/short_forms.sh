#!/bin/bash
#SBATCH -N2 -c4 -Jshort -t60 -pdebug
python run.py
