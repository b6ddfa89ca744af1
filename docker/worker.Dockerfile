# The image a unit's Kubernetes Job runs (the spec's toolchain.image): TensorRT-LLM's release image with
# enginefoundry installed into its Python, and AIPerf in a venv of its own. Build from the project folder:
#
#   docker build -f docker/worker.Dockerfile --build-arg TRTLLM_VERSION=1.2.1 -t registry.example/enginefoundry-trtllm:1.2.1 .
#   docker push registry.example/enginefoundry-trtllm:1.2.1    # then put its digest in toolchain.image_digest
#
# TRTLLM_VERSION must be the spec's toolchain.trtllm_version (the lanes check the version they find).
ARG TRTLLM_VERSION=1.2.1
FROM nvcr.io/nvidia/tensorrt-llm/release:${TRTLLM_VERSION}

# Where the project lies in the image: the deployments' pull step changes into $PROJECT_DIR
# (`PROJECT_DIR=/opt/enginefoundry prefect deploy ...`, k8s/README.md), so flows/ must be here.
WORKDIR /opt/enginefoundry
COPY pyproject.toml README.md deployment.yaml ./
COPY enginefoundry ./enginefoundry
COPY flows ./flows
COPY tasks ./tasks
COPY configs ./configs

# enginefoundry goes into the image's own Python, next to TensorRT-LLM, without moving any package TensorRT-LLM
# was released with: every installed version is a constraint, so a conflict fails this build instead of
# changing the runtime silently. Not editable: the wheel carries flows/tasks as enginefoundry.flows/.tasks.
RUN python3 -m pip list --format=freeze --exclude-editable | grep -v '^enginefoundry==' > /tmp/image-constraints.txt \
 && python3 -m pip install --no-cache-dir -c /tmp/image-constraints.txt . \
 && rm /tmp/image-constraints.txt \
 && python3 -c "import enginefoundry.flows.build_unit, tensorrt_llm; print('tensorrt_llm', tensorrt_llm.__version__)"

# AIPerf pins rich~=14.1, pandas and pyzmq: its own venv, found through EF_AIPERF (enginefoundry/bench/aiperf.py).
RUN (python3 -m venv /opt/venv-bench || (apt-get update && apt-get install -y --no-install-recommends python3-venv \
      && rm -rf /var/lib/apt/lists/* && python3 -m venv /opt/venv-bench)) \
 && /opt/venv-bench/bin/pip install --no-cache-dir 'aiperf==0.13.0' \
 && /opt/venv-bench/bin/aiperf --help >/dev/null
ENV EF_AIPERF=/opt/venv-bench/bin/aiperf \
    PROJECT_DIR=/opt/enginefoundry \
    HF_HOME=/cache/huggingface \
    EF_CACHE_DIR=/cache/enginefoundry \
    OMP_NUM_THREADS=1
