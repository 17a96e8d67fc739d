# tfx on a CUDA PyTorch base image. Build: docker build -t tfx .
# Run:   docker run --gpus all -v $PWD/outputs:/tfx/outputs tfx python -m tfx.train +experiment=iwslt
FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime

WORKDIR /tfx
COPY pyproject.toml README.md ./
COPY tfx ./tfx
COPY conf ./conf
COPY scripts ./scripts
RUN pip install --no-cache-dir -e ".[plot]"

ENV PYTHONUNBUFFERED=1
CMD ["python", "-m", "tfx.train", "+experiment=iwslt"]
