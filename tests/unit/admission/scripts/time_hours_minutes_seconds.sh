#!/bin/bash
#SBATCH --time=12:30:00
hostname
