#!/bin/bash
#SBATCH --begin=now+1hour
hostname
