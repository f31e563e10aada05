#!/bin/bash
#SBATCH -t2-06:30
hostname
