#!/bin/bash
#SBATCH -N 2
#SBATCH -w node[01-02]
#SBATCH -x node[03-04],node07
hostname
