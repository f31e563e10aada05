#!/bin/bash
#SBATCH --time=3-00:00:05
hostname
