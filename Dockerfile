# Sluice's container image: one static binary on an empty base.
# `make image` builds the same image without a container daemon or a
# registry (cmd/sluice-image writes it as an OCI layout tar); this file is
# for builders that have them (docker build, buildah bud, kaniko).
# VERSION defaults to the chart's appVersion (deploy/helm/sluice/Chart.yaml);
# tag the image sluice:v<VERSION>, the chart's default image.
#
# The aggregator runs as the non-root user 65532 (the image's default);
# the exporter's DaemonSet runs it as root with only CAP_NET_ADMIN, which
# conntrack netlink needs.

FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=0.1.0
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/sluice ./cmd/sluice
RUN mkdir -p /rootfs/etc /rootfs/tmp /rootfs/home/nonroot /rootfs/usr/local/bin \
 && printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >/rootfs/etc/passwd \
 && printf 'root:x:0:\nnonroot:x:65532:\n' >/rootfs/etc/group \
 && chmod 1777 /rootfs/tmp && chown 65532:65532 /rootfs/home/nonroot && chmod 700 /rootfs/home/nonroot \
 && cp /out/sluice /rootfs/usr/local/bin/sluice

FROM scratch
COPY --from=build /rootfs/ /
ENV PATH=/usr/local/bin
USER 65532:65532
EXPOSE 4739/tcp 4739/udp 14739/tcp 14740/tcp 10348/tcp
ENTRYPOINT ["/usr/local/bin/sluice"]
CMD ["version"]
