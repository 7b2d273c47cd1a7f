# Source this at the start of a device (GPU machine) command: makes the dustin packages importable
# without network access. Usage: `DUSTIN_GIT_COMMIT=<sha of the tree sent> source scripts/device_env.sh`
# (the device copy's .git can lag the working tree; result files record $DUSTIN_GIT_COMMIT).
export PYTHONUNBUFFERED=1
mkdir -p /tmp/dustin_path
ln -sfn "$PWD/kernels/dustin_kernels" /tmp/dustin_path/dustin_kernels
export PYTHONPATH="$PWD:/tmp/dustin_path${PYTHONPATH:+:$PYTHONPATH}"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, 'gpu', torch.cuda.get_device_name())"
