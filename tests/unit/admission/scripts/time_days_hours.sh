#!/bin/bash
#SBATCH --time 1-12
hostname
