import { x } from "./core/x.ts"; console.log(x);
