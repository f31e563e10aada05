#SBATCH -N 1
python run.py
