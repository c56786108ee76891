// The web console at /console/: static pages (no build step) that call the same routes a
// script calls. Every answer here carries a Content-Security-Policy without inline script.
import express, { type Router } from 'express';
import { fileURLToPath } from 'node:url';

export const CONSOLE_CSP = [
  "default-src 'none'",
  "script-src 'self'",
  "style-src 'self'",
  "img-src 'self' data:",
  "connect-src 'self'",
  "base-uri 'none'",
  "form-action 'self'",
  "frame-ancestors 'none'",
].join('; ');

const STATIC_DIR = fileURLToPath(new URL('./static/', import.meta.url));

export function consoleRouter(): Router {
  const router = express.Router();
  router.use('/console', (req, res, next) => {
    res.set({
      'content-security-policy': CONSOLE_CSP,
      'x-content-type-options': 'nosniff',
      'referrer-policy': 'no-referrer',
      'cache-control': 'no-cache',
    });
    if (req.method === 'GET' && req.originalUrl === '/console') res.redirect(308, '/console/');
    else next();
  });
  router.use('/console', express.static(STATIC_DIR, { index: 'index.html', redirect: false, dotfiles: 'deny' }));
  return router;
}
