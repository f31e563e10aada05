#!/bin/bash
#SBATCH --begin=2026-12-01T08:30
hostname
