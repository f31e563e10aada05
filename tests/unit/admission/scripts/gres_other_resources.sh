#!/bin/bash
#SBATCH --gres=gpu:2,nic:1
python run.py
