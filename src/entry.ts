// Program entry (the bundle's and `node src/entry.ts`'s).
import { main } from './main.ts';

void main(process.argv.slice(2));
