# syntax=docker/dockerfile:1
# One image for every role: `sarsen --role api|executor|both` (default both).
# test/integration/dockerfile.test.ts reproduces each stage from these COPY lines and the npm
# commands of its RUN lines, then starts the result against PostgreSQL until /readyz answers.

FROM node:24-slim AS build
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --ignore-scripts --no-audit --no-fund
COPY tsconfig.json tsconfig.build.json ./
COPY src ./src
COPY tasks ./tasks
RUN npx tsc -p tsconfig.build.json

FROM node:24-slim AS deps
WORKDIR /app
COPY package.json package-lock.json ./
# Production dependencies only; embedded PostgreSQL is a development convenience the image
# does not need (a deployment names its database with CTX_DATABASE_HOST).
RUN npm ci --omit=dev --omit=optional --ignore-scripts --no-audit --no-fund

FROM node:24-slim
ENV NODE_ENV=production
# Runtime settings (fewer malloc arenas, V8's young generation and heap limit) are chosen by
# bin/sarsen.js at startup, as for npm start: the heap limit is half of the container's memory
# limit when there is one (at most 1 GB), else 1 GB (src/core/runtime-flags.ts). A heap size
# set in NODE_OPTIONS wins.
WORKDIR /app
COPY --from=deps /app/node_modules ./node_modules
COPY --from=build /app/dist ./dist
COPY sql ./dist/sql
COPY src/http/console/static ./dist/src/http/console/static
COPY package.json ./
COPY bin ./bin
RUN ln -s /app/bin/sarsen.js /usr/local/bin/sarsen && chmod +x /app/bin/sarsen.js
USER node
EXPOSE 8080
ENTRYPOINT ["sarsen"]
CMD ["serve"]
