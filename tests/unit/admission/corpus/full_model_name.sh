#!/bin/bash
#SBATCH --gres=gpu:nvidia_h100_80gb_hbm3:1
python probe.py
