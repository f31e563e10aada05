#!/bin/bash
#SBATCH -t 30:15
hostname
