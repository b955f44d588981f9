# routerd with the simulator backends (routerd-sim): enough for the demo cluster (compose.yaml)
# or a single node on the embedded default. For real backends, build FROM an image that has
# llama-server / sd-server / whisper-server and point binary_path at them.
FROM python:3.11-slim-bookworm

RUN useradd --system --home-dir /var/lib/routerd --shell /usr/sbin/nologin routerd \
    && install -d -o routerd -g routerd /var/lib/routerd
COPY . /src
RUN pip install --no-cache-dir /src \
    && install -d /srv/routerd && cp -r /src/etc /srv/routerd/etc \
    && rm -rf /src

USER routerd
# memory given back after a crowd of held requests drains (README "Performance")
ENV PYTHONMALLOC=malloc
WORKDIR /var/lib/routerd
EXPOSE 8080
ENTRYPOINT ["routerd"]
CMD ["run"]
