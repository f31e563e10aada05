#!/bin/bash
#SBATCH -t 30
hostname
